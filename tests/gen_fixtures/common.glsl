// Included by fixtures: proves includes resolve against the shader directory.
float sq(float x) { return x * x; }

#version 450
// Binding 1 is declared but never used: it is still reflected (the descriptor set layout must
// hold it, and the runtime binds a buffer there) and, having no qualifier, is writable.
layout(local_size_x = 8) in;
layout(set = 0, binding = 0) buffer Used { float u[]; };
layout(set = 0, binding = 1) buffer Unused { float n[]; };
void main() { u[gl_GlobalInvocationID.x] = 1.0; }

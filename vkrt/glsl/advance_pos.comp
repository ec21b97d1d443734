#version 450
// The last dispatch of a replayed decode step: pos[0] += n, so the step's next replay runs at
// the next position (rope_pos, copy_rows_pos and attention_split_pos read pos[0]).
// pos: [1] u32. Dispatch: (1, 1, 1). Push constants: n (u32, positions the step covered).
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Pos { uint pos[]; };
layout(push_constant) uniform Push { uint n; } pc;

void main() {
    pos[0] += pc.n;
}

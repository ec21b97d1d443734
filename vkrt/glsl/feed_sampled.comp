#version 450
// The first dispatch of a batched step: token ids the host did not know when it wrote the
// step (asynchronous scheduling: a sequence's next token is the greedy token of the step
// still running). ids[t] = src[t] == 0xFFFFFFFF ? ids[t] : sampled[src[t]], where sampled
// holds the previous step's argmax rows (copied there at its end) and src[t] is the logit row
// of that step whose token t is.
// ids, src: [n_tokens] u32; sampled: [rows] u32. Dispatch: (ceil(n_tokens / 64), 1, 1).
// Push constants: n_tokens.
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Ids { uint ids[]; };
layout(set = 0, binding = 1) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 2) readonly buffer Sampled { uint sampled[]; };
layout(push_constant) uniform Push { uint n_tokens; } pc;

void main() {
    uint t = gl_GlobalInvocationID.x;
    if (t >= pc.n_tokens) return;
    uint r = src[t];
    if (r != 0xFFFFFFFFu) ids[t] = sampled[r];
}

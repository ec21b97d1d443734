#version 450
// Subgroup reduction with a shared-memory pass over subgroup partials (as vkrt's reduce.glsl
// and llama.cpp's mul_mat_vec): subgroup arithmetic and ballot, two ordinary spec constants.
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_ballot : require
layout(local_size_x_id = 0, local_size_y_id = 1) in;
layout(constant_id = 2) const uint ROWS_PER_WG = 2;
layout(constant_id = 3) const bool USE_BALLOT = true;
layout(set = 0, binding = 0) readonly buffer W { vec4 w[]; };
layout(set = 0, binding = 1) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint cols4; uint rows; } pc;
shared float partial[32];
void main() {
    uint row = gl_WorkGroupID.x * ROWS_PER_WG + gl_LocalInvocationID.y;
    float acc = 0.0;
    for (uint c = gl_LocalInvocationID.x; c < pc.cols4; c += gl_WorkGroupSize.x)
        acc += dot(w[row * pc.cols4 + c], x[c]);
    acc = subgroupAdd(acc);
    if (USE_BALLOT && subgroupBallotBitCount(subgroupBallot(acc != 0.0)) == 0) acc = 0.0;
    if (subgroupElect()) partial[gl_SubgroupID] = acc;
    barrier();
    if (gl_LocalInvocationIndex == 0) {
        float r = 0.0;
        for (uint i = 0; i < gl_NumSubgroups; ++i) r += partial[i];
        if (row < pc.rows) y[row] = r;
    }
}

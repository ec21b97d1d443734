// Grids larger than one dimension allows. maxComputeWorkGroupCount is 65,535 per dimension
// on many devices (the minimum the Vulkan spec requires, "Limit Requirements"); a grid of G
// workgroups is dispatched as (min(G, limit_x), ceil(G / limit_x), 1) by the host
// (vkrt/kernels.py `spread`), and the shader takes its linear workgroup index from both.
// Workgroups past G (the last row of y may be partial) must return: callers bound-check the
// index they compute from it.
uint linear_workgroup() {
    return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}

// The token of a kernel whose tokens run along y, spilling into z past limit_y.
uint token_index() {
    return gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y;
}

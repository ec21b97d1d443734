// Workgroup-wide sums of several values at once (a decode product's rows): one barrier for
// all of them, where workgroup_sum (reduce.glsl) takes two per value. Each sum is the one
// workgroup_sum gives for up to REDUCE_SERIAL subgroups (the value's subgroupAdd per
// subgroup, then the subgroups' partials added in subgroup order, from 0.0), so a kernel
// that moves to these keeps its bits there; past REDUCE_SERIAL subgroups the order is
// still this one (workgroup_sum's differs).
// The includer includes reduce.glsl first and declares `const uint REDUCE_ROWS` (the most
// values, a specialization-constant expression). Use: every invocation calls
// reduce_rows_put(i, v_i) for each value i (uniform control flow), then barrier(), then any
// invocation may read reduce_rows_get(i).
shared float reduce_rows_s[REDUCE_ROWS * gl_WorkGroupSize.x];   // [value][subgroup]

void reduce_rows_put(uint i, float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) reduce_rows_s[i * gl_WorkGroupSize.x + gl_SubgroupID] = v;
}

float reduce_rows_get(uint i) {
    float r = 0.0;
    for (uint s = 0; s < reduce_subgroups(); ++s) r += reduce_rows_s[i * gl_WorkGroupSize.x + s];
    return r;
}

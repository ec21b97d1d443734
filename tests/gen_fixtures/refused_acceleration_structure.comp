#version 460
// A ray-query acceleration structure descriptor: refused in words, not by type opcode.
#extension GL_EXT_ray_query : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer O { float o[]; };
layout(set = 0, binding = 1) uniform accelerationStructureEXT tlas;
void main() {
    rayQueryEXT q;
    rayQueryInitializeEXT(q, tlas, 0, 0xFF, vec3(0), 0.0, vec3(0, 0, 1), 1.0);
    o[0] = rayQueryProceedEXT(q) ? 1.0 : 0.0;
}

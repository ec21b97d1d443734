#version 450
// Descriptors other than set-0 storage buffers: reflected, but gen-spirv refuses them for
// the package (the runtime binds only single set-0 storage buffers).
layout(local_size_x = 4, local_size_y = 4) in;
layout(set = 0, binding = 0) buffer Out { vec4 o[]; };
layout(set = 1, binding = 0) readonly buffer InSet1 { vec4 s1[]; };
layout(set = 0, binding = 1) uniform Params { vec4 scale; uint n; } params;
layout(set = 0, binding = 2, rgba32f) uniform readonly image2D img_in;
layout(set = 0, binding = 3, rgba32f) uniform writeonly image2D img_out;
layout(set = 0, binding = 4) uniform sampler smp;
layout(set = 0, binding = 5) uniform texture2D tex;
layout(set = 0, binding = 6) uniform sampler2D combined;
layout(set = 0, binding = 7, r32f) uniform readonly imageBuffer texel_store;
layout(set = 0, binding = 8) uniform samplerBuffer texel_uniform;
layout(set = 0, binding = 9) uniform textureBuffer texel_separate;
layout(set = 2, binding = 3, rgba8) uniform image2D imgs[2];
void main() {
    ivec2 p = ivec2(gl_GlobalInvocationID.xy);
    vec4 v = imageLoad(img_in, p) * params.scale + s1[p.x];
    v += texture(sampler2D(tex, smp), vec2(0.5)) + texture(combined, vec2(0.5));
    v += imageLoad(texel_store, p.x).xxxx + texelFetch(texel_uniform, p.x);
    v += texelFetch(texel_separate, p.x) + imageLoad(imgs[1], p);
    imageStore(img_out, p, v);
    imageStore(imgs[0], p, v);
    o[p.x + p.y * int(params.n)] = v;
}

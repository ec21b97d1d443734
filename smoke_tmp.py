import time, sys
from vkrt import config
from vkrt.models.default_model import find_default_model
from vkrt.models.gguf import load_gguf
from vkrt.models.llama import Llama
from vkrt.models.tokenizer import Tokenizer
from vkrt.models.generate import generate
from vkrt.runtime.device import Device
g = load_gguf(find_default_model()); tok = Tokenizer.from_metadata(g.metadata)
for n in map(int, sys.argv[1].split(",")):
    with config.INFLIGHT.override(str(n)), Device(direct_host_access=(False if len(sys.argv)>2 else None)) as d:
        m = Llama.from_gguf(d, g)
        generate(m, tok.encode("1, 2, 3, 4, 5,"), 2)
        b = m.stream.counters.snapshot(); m.stream.profiler.phases_ns.clear()
        t=time.perf_counter()
        r = generate(m, tok.encode("1, 2, 3, 4, 5,"), 8)
        print(n, repr(tok.decode(r.tokens)), f"{time.perf_counter()-t:.2f}s tpot {1e3*r.decode_s/7:.0f}ms", {k:v for k,v in m.stream.counters.since(b).items() if k in ("submits","waits_blocked","waits_ready","max_inflight","slot_reuses","deferred_frees","deferred_freed")}, m.stream.profiler.report())
        m.close()

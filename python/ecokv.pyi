"""ecokv: KV cache compression methods (ECOKV, MadaKV and their baselines) over arrays (python/module.cpp)."""
from typing import Any, Dict, List

import numpy as np

def methods() -> List[Dict[str, str]]:
    """The registry's scorers and allocators: name, kind ("scorer" or "allocator"), description, defaults."""

def options() -> List[Dict[str, Any]]:
    """The method options of the option table: key, help, default, unset, choices."""

def select(keys: Any, queries: Any, *, values: Any = None, **options: Any) -> List[List[np.ndarray]]:
    """The tokens each (layer, KV head) keeps, ascending int32 indices per [layer][head].

    keys: [layers, kv_heads, tokens, head_dim] post-RoPE; queries: [layers, heads, n_queries, head_dim] (the
    observation window's); values: [layers, kv_heads, tokens, head_dim_v] for methods that read them. float32 or
    float16, anything with the buffer protocol (numpy; torch CPU tensors through .numpy()), read in place.
    options: the option table's keys (method="adakv+ecokv", budget=64, window=8, alpha=0.8, ...).
    Raises ValueError with the library's message for a bad shape, option or value (NaN)."""

def load_capture(path: str) -> Dict[str, np.ndarray]:
    """A capture file (SPEC §7 safetensors) as float32 arrays: keys, values, queries. OSError for a bad file."""

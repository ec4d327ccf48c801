"""ecokv: KV cache compression methods (ECOKV, MadaKV and their baselines) over arrays (python/module.cpp)."""
from typing import Any, Dict, List, Optional

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

class Sequence:
    """A prefilled prompt's KV cache, full or compressed."""
    kv_bytes: int  # KV bytes the cache holds
    n_cells: int   # the prompt's cells
    def compress(self, **options: Any) -> "Sequence":
        """A compressed copy of this full-cache sequence (method=, budget=, window=, ...)."""
    def ask(self, question: Any, max_tokens: int = 32, temperature: float = 0.0, seed: int = 0,
            stream: bool = False) -> Any:
        """The answer to a question (str), or the answers to a list of them, each from the prompt's state: greedy or
        sampled at `temperature` (seeded); stream=True: an iterator of text pieces (one question)."""
    def save(self) -> bytes:
        """The cache as bytes (ecokv's checked entry format), for Model.resume()."""
    def kept(self) -> Optional[List[List[np.ndarray]]]:
        """[layer][head] int32 arrays of the prompt cells each KV head kept; None for a full cache."""

class Model:
    """A GGUF model (and libmtmd projector) loaded by llama.cpp."""
    def __init__(self, path: str, mmproj: Optional[str] = None, verbose: bool = False, **engine: Any) -> None:
        """Engine options by llama.cpp's names: n_gpu_layers=0, n_ctx, type_k, type_v, n_threads, flash_attn, ..."""
    def resume(self, saved: bytes, *, max_tokens: int = 32) -> Sequence:
        """A sequence from Sequence.save()'s bytes; ValueError for another model's, a corrupted or truncated entry."""
    def prefill(self, prompt: str, images: List[str] = [], *, max_tokens: int = 32, **options: Any) -> Sequence:
        """Prefills the context (images as file paths); with compression options, compressed as `ecokv run` does."""

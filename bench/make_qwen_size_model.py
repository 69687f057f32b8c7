"""Build a random-weight model with Qwen2.5-0.5B-Instruct's architecture and sizes, for speed work
at the real cost per token without hub access (tests/support/random_models.py builds it). The text
it writes is noise: use it for timing only.

    python -m bench.make_qwen_size_model [OUT_DIR]     (default ~/.cache/llmq/models/qwen2.5-0.5b-random)
    python -m bench.make_qwen_size_model --tiny [OUT_DIR]   (a 2-layer one: a second catalog model
                                                            that loads in a second, for tests)
"""
from __future__ import annotations

import sys
from pathlib import Path

from tests.support.random_models import QWEN25_05B, TINY, build, default_out

if __name__ == "__main__":
    tiny = "--tiny" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--tiny"]
    print(build(Path(args[0]) if args else default_out(tiny), TINY if tiny else QWEN25_05B))

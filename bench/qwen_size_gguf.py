"""The random-weight Qwen2.5-0.5B-size model (`python -m bench.make_qwen_size_model`) as a GGUF file, for
llama.cpp's `llama-server` in the side-by-side benchmark.

    python -m bench.qwen_size_gguf LLAMA_CPP_DIR [MODEL_DIR] [--outtype q8_0]

LLAMA_CPP_DIR is a llama.cpp source tree (the one vendored in llama-cpp-python's sdist works); its
own `convert_hf_to_gguf.py` does the conversion. One thing is set by hand: the model borrows the
embedded SmolLM2 tokenizer, re-exported from its GGUF, whose fingerprint the converter's table of
known tokenizers does not list, so the converter is told it is SmolLM2's ("smollm") instead of
refusing it.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from tests.support.random_models import build, default_out


def convert(llama_cpp: Path, model_dir: Path, outtype: str) -> Path:
    out = model_dir.with_name(f"{model_dir.name}-{outtype}.gguf")
    if out.exists():
        return out
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    from conversion import base  # llama.cpp's converter package, importable from its tree

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", outtype, "--outfile", str(out)]
    runpy.run_path(str(llama_cpp / "convert_hf_to_gguf.py"), run_name="__main__")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("llama_cpp", type=Path, help="llama.cpp source tree")
    parser.add_argument("model_dir", type=Path, nargs="?", default=None)
    parser.add_argument("--outtype", default="q8_0")
    args = parser.parse_args()
    model_dir = build(args.model_dir or default_out())
    print(convert(args.llama_cpp.resolve(), model_dir, args.outtype))


if __name__ == "__main__":
    main()

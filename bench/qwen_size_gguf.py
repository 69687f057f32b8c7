"""The random-weight Qwen2.5-0.5B-size model (`python -m bench.make_qwen_size_model`) as a GGUF file, for
llama.cpp's `llama-server` in the side-by-side benchmark.

    python -m bench.qwen_size_gguf LLAMA_CPP_DIR [MODEL_DIR] [--outtype q8_0]

LLAMA_CPP_DIR is a llama.cpp source tree (the one vendored in llama-cpp-python's sdist works); its
own `convert_hf_to_gguf.py` does the conversion. MODEL_DIR (default: the random model's place in the
model cache) is built there when it holds no model; a folder that holds another model (the embedded
one, a real Qwen2.5) is converted as it is. One thing is set by hand: the random model borrows the
embedded SmolLM2 tokenizer, re-exported from its GGUF, whose fingerprint the converter's table of
known tokenizers does not list, so for that tokenizer the converter is told it is SmolLM2's
("smollm") instead of refusing it.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from tests.support.random_models import borrows_embedded_tokenizer, build, default_out, random_build


def convert(llama_cpp: Path, model_dir: Path, outtype: str) -> Path:
    out = model_dir.with_name(f"{model_dir.name}-{outtype}.gguf")
    if out.exists():
        return out
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    from conversion import base  # llama.cpp's converter package, importable from its tree

    known_pre = base.TextModel.get_vocab_base_pre

    def pre_tokenizer(self, tokenizer) -> str:
        try:
            return known_pre(self, tokenizer)
        except NotImplementedError:
            if borrows_embedded_tokenizer(model_dir):
                return "smollm"
            raise

    base.TextModel.get_vocab_base_pre = pre_tokenizer
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", outtype, "--outfile", str(out)]
    runpy.run_path(str(llama_cpp / "convert_hf_to_gguf.py"), run_name="__main__")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("llama_cpp", type=Path, help="llama.cpp source tree")
    parser.add_argument("model_dir", type=Path, nargs="?", default=None)
    parser.add_argument("--outtype", default="q8_0")
    args = parser.parse_args()
    model_dir = args.model_dir or default_out()
    if not model_dir.exists() or random_build(model_dir):
        model_dir = build(model_dir)  # (again, if an older recipe built it)
    print(convert(args.llama_cpp.resolve(), model_dir, args.outtype))


if __name__ == "__main__":
    main()

"""The OpenVINO engine without llmq around it: one `ContinuousBatchingPipeline`, built by llmq's own
`build_pipeline` on the source llmq's worker would serve (same scheduler, threads, precision,
weights), behind a minimal OpenAI server. The benchmark's "same engine, no queue" baseline.

    LLMQ_MODEL=embedded HF_HUB_OFFLINE=1 .venv/bin/python -m bench.harness.openvino_app --port 8011

Settings come from LLMQ_* (LLMQ_DTYPE, LLMQ_KV_CACHE_MB, LLMQ_MAX_BATCH_SIZE, LLMQ_WEIGHTS, ...).
Prompts are llmq's (`PromptBuilder`), text is llmq's (`IncrementalDetokenizer`). One thread owns
the pipeline: it adds the requests handed to it, steps while any is unfinished, and passes each
request its new token ids; the request threads detokenize and stream. (All pipeline calls in that
one thread, rather than a lock shared with the request threads: a Python lock is not fair, and a
loop re-taking it after every step would keep new requests out.)
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, jsonify, request

from bench.harness.llmq_pipeline import llmq_pipeline
from common.prompting import PromptBuilder
from common.settings import Settings
from worker.engine.detokenizer import IncrementalDetokenizer, load_tokenizer
from worker.engine.model_config import eos_token_ids
from worker.engine.openvino_core import generation_config, read_new_tokens
from worker.engine.sequence import Sampling

log = logging.getLogger("openvino_server")


@dataclass
class Live:
    prompt_ids: list[int]
    config: Any
    out: queue.Queue = field(default_factory=queue.Queue)  # (new ids, finish reason | None) or an error
    handle: Any = None
    cancelled: bool = False


class Batcher:
    """The thread that owns the pipeline (see the module docstring)."""

    def __init__(self, pipeline):
        self.pipeline, self.pending, self.live = pipeline, [], {}
        self.cond, self.ids = threading.Condition(), itertools.count()
        threading.Thread(target=self.loop, daemon=True, name="step").start()

    def submit(self, live: Live) -> None:
        with self.cond:
            self.pending.append(live)
            self.cond.notify()

    def loop(self) -> None:
        import numpy as np
        import openvino as ov
        import openvino_genai as ovg

        while True:
            with self.cond:
                while not self.pending and not self.live and not self.pipeline.has_non_finished_requests():
                    self.cond.wait()
                new, self.pending = self.pending, []
            for live in new:
                if not live.cancelled:
                    try:
                        ids = ov.Tensor(np.asarray([live.prompt_ids], dtype=np.int64))
                        live.handle = self.pipeline.add_request(next(self.ids), ids, live.config)
                        self.live[id(live)] = live
                    except Exception as exc:
                        live.out.put(exc)
            for key, live in list(self.live.items()):
                if live.cancelled:  # dropped by the pipeline at its next step
                    live.handle.cancel()
                    del self.live[key]
            try:
                self.pipeline.step()
            except Exception as exc:
                log.exception("step failed")
                for live in self.live.values():
                    live.out.put(exc)
                self.live.clear()
                continue
            for key, live in list(self.live.items()):
                if live.handle.can_read():
                    new_ids, reason, _ = read_new_tokens(live.handle)
                    live.out.put((new_ids, reason))
                elif live.handle.get_status() == ovg.GenerationStatus.IGNORED:
                    live.out.put(ValueError("the prompt does not fit the KV cache (LLMQ_KV_CACHE_MB)"))
                    reason = "error"
                else:
                    continue
                if reason is not None:
                    del self.live[key]


logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
settings = Settings()
model, pipeline, info = llmq_pipeline(settings)
prompts, tokenizer, eos = PromptBuilder(model.path, settings.max_model_len), load_tokenizer(model.path), eos_token_ids(model.path)
batcher = Batcher(pipeline)
app = Flask(__name__)


@app.get("/health")
def health():
    return jsonify(status="ok", model=model.name, **info)


@app.get("/v1/models")
def models():
    return jsonify(object="list", data=[{"id": model.name, "object": "model", "created": 0, "owned_by": "llmq-bench"}])


@app.post("/v1/chat/completions")
def chat_completions():
    body = request.get_json()
    _, prompt_ids = prompts.build(body["messages"], None)
    room = prompts.context_length - len(prompt_ids)
    if room <= 0 or len(prompt_ids) >= info["kv_capacity_tokens"]:
        return jsonify(error={"message": "the prompt is too long", "type": "invalid_request_error"}), 400
    stop = body.get("stop") or ()
    sampling = Sampling(max_tokens=min(body.get("max_completion_tokens") or body.get("max_tokens") or 256, room),
                        temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                        seed=body.get("seed"), presence_penalty=body.get("presence_penalty", 0.0),
                        frequency_penalty=body.get("frequency_penalty", 0.0))
    live = Live(prompt_ids, generation_config(sampling, eos))
    batcher.submit(live)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model.name}
    detok = IncrementalDetokenizer(tokenizer, (stop,) if isinstance(stop, str) else tuple(stop))

    def pieces():  # (text, finish reason | None, completion tokens); raises the engine's error
        tokens = 0
        while True:
            item = live.out.get()
            if isinstance(item, Exception):
                raise item
            new_ids, reason = item
            text = ""
            for token in new_ids:
                tokens += 1
                text += detok.add(token)
                if detok.stopped:
                    live.cancelled = True
                    yield text, "stop", tokens
                    return
            if reason is not None:
                yield text + detok.flush(), reason, tokens
                return
            yield text, None, tokens

    usage = lambda n: {"prompt_tokens": len(prompt_ids), "completion_tokens": n, "total_tokens": len(prompt_ids) + n}
    if not body.get("stream"):
        try:
            parts = list(pieces())
        except Exception as exc:
            return jsonify(error={"message": str(exc), "type": "server_error"}), 500
        message = {"role": "assistant", "content": "".join(p[0] for p in parts)}
        return jsonify(**head, object="chat.completion", usage=usage(parts[-1][2]),
                       choices=[{"index": 0, "message": message, "logprobs": None, "finish_reason": parts[-1][1]}])
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta=None, reason=None, **extra) -> str:
        choices = [] if delta is None and reason is None else \
            [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": reason}]
        return f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': choices, **extra})}\n\n"

    def events():
        finished = False
        try:
            yield chunk({"role": "assistant", "content": ""})
            for text, reason, tokens in pieces():
                if text:
                    yield chunk({"content": text})
                if reason is not None:
                    yield chunk({}, reason)
                    if include_usage:
                        yield chunk(usage=usage(tokens))
            finished = True
        except Exception as exc:
            finished = True
            yield f"data: {json.dumps({'error': {'message': str(exc), 'type': 'server_error'}})}\n\n"
        finally:
            live.cancelled = live.cancelled or not finished  # the client left: free its batch slot
        yield "data: [DONE]\n\n"

    return Response(events(), mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    app.run(args.host, args.port, threaded=True)

"""The baseline llmq is measured against: one Flask process calling `model.generate`, one request
at a time (a lock), streaming with TextIteratorStreamer. Same SSE shape as llmq's job events.

    python -m bench.harness.baseline_app MODEL_DIR PORT [DTYPE]

DTYPE (default auto) resolves as llmq's workers do, so both run the same arithmetic.
"""
from __future__ import annotations

import json
import sys
import threading
import uuid

from flask import Flask, Response, jsonify, request
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

from worker.engine.runner_hf import resolve_dtype

model_dir, port = sys.argv[1], int(sys.argv[2])
dtype = resolve_dtype(sys.argv[3] if len(sys.argv) > 3 else "auto")
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
lock = threading.Lock()
app = Flask(__name__)


@app.get("/health")
def health():
    return jsonify(status="ok")


@app.post("/generate")
def generate():
    body = request.get_json()
    ids = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    max_tokens, temperature = body.get("max_tokens", 64), body.get("temperature", 0)

    def events():
        with lock:  # one job at a time: the usual single-process server
            streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
            kwargs = dict(**ids, max_new_tokens=max_tokens, streamer=streamer,
                          do_sample=temperature > 0, pad_token_id=tokenizer.eos_token_id)
            if temperature > 0:
                kwargs["temperature"] = temperature
            result = {}
            thread = threading.Thread(target=lambda: result.update(out=model.generate(**kwargs)))
            thread.start()
            for index, text in enumerate(t for t in streamer if t):
                yield f"event: chunk\ndata: {json.dumps({'index': index, 'text': text})}\n\n"
            thread.join()
            completion = result["out"].shape[1] - ids["input_ids"].shape[1]
            usage = {"prompt_tokens": ids["input_ids"].shape[1], "completion_tokens": completion}
            yield f"event: done\ndata: {json.dumps({'status': 'succeeded', 'usage': usage})}\n\n"

    return Response(events(), mimetype="text/event-stream", headers={"X-Job-Id": uuid.uuid4().hex})


if __name__ == "__main__":
    app.run("127.0.0.1", port, threaded=True)

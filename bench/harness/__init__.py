"""The benchmarks' library: one home for each thing every benchmark needs.

- servers.py: what a benchmark starts and stops: an llmq stack (workers + gunicorn API) and the
  servers it is compared with (the one-at-a-time baseline, vLLM's, OpenVINO's, llama.cpp's)
- baseline_app.py, openvino_app.py, floor_app.py: the server programs of those peers that llmq
  itself provides
- engine_app.py: the OpenVINO pipeline driven in process by closed-loop clients, no server: the
  ceiling llmq's OpenVINO stack is measured against
- llmq_pipeline.py: that pipeline exactly as llmq's worker builds it (for both programs above)
- clients.py: one request as a client sees it (`Sample`), over llmq's jobs API, OpenAI chat
  completions and responses, streamed
- burst.py: thousands of streaming clients at once from one asyncio client (the front door)
- load.py: closed-loop clients driving a server, and servers taking turns
- stats.py: the one percentile, and a level's summary row
- prompts.py: the prompts the benchmarks send
- results.py: levels on the command line, result files, markdown tables
- measures.py: CPU time and memory of the processes under test
- chaos.py: faults for the soak (worker kills, a Redis failover)
"""

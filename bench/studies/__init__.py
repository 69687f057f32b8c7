"""Studies: each measures one feature once, side by side with it off (most decided a default);
`python -m bench.studies.<name> --help` says how. Their figures are in docs/benchmarks.md.

- affinity_bench: prefix affinity across two workers; `--prefix-cache`: the prefix cache on one
- batch_bench: interactive time to first token alone and under a large batch
- eta_bench: the queue's start and finish estimates against the real ones
- held_jobs: what holding 16/64/256 jobs costs a worker beside its engine
- kernels: dtype and attention kernels per decode step
- long_prompts: long unique prompts (a mode of `bench.bench --openai --long-prompts`)
- models_on_demand: two catalog models on one worker, room for one against both
- prompt_lookup: OpenVINO with and without prompt-lookup drafting
- responses_cost: streamed responses against streamed chat completions
- scaling_signal: the autoscaling signal against the true backlog during a ramp
- weights_quality: OpenVINO weight formats against the float model
- worker_memory: memory and start-up of one worker per engine
"""

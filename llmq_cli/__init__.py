"""`llmq`: the command-line client (batches, one-off prompts). Talks HTTP only; imports nothing of
the server, so it installs and runs anywhere `requests`, `click` and `tqdm` do."""

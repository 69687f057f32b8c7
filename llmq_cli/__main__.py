from llmq_cli.main import cli

cli()

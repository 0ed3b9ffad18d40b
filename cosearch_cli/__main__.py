from cosearch_cli.cli import main

main()

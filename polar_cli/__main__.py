from polar_cli.cli import main

main()

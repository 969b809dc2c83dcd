from swabench.cli import main

main()

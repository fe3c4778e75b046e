from overlapbench.cli import main

main()

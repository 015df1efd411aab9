from k25exp.cli import main

main()

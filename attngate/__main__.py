from attngate.cli import main

main()

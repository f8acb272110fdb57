from inferbus.cli import main

main()

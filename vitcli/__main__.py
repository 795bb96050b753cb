from vitcli.cli import main

main()

from kvmigrate.cli import main

main()

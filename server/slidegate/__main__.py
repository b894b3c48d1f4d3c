from slidegate.cli import main

main()

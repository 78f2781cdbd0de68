"""The `verispec` command line: main (the parser and the dispatcher), options (flags shared by
commands), comma_list, and one module per command (generate, chat, pull, serve, train, bench,
verify)."""

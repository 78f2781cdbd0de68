"""The `verispec` command line: main (the parser and the generate/serve/train commands), options
(flags shared by commands), chat, verify and bench (one module per larger command)."""

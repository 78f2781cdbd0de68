"""What the benchmark scripts share and the package does not need: the weight-streaming floor,
llama.cpp's tools, the pair benchmark's tables, model-free drafters replayed on recorded
outputs. Scripts import it as `lib` (their own directory is on the path); tests as
`benchmarks.lib`."""

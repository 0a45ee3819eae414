# zipccl beside DietGPU and nvCOMP (issue 13): from experiments/bench_peers.py's records.
FIGURES += out/codec_peers.png

out/codec_peers.png: fig_codec_peers.py ../experiments/results/codec_peers.jsonl
	$(PYTHON) fig_codec_peers.py $@ $(filter %.jsonl,$^)

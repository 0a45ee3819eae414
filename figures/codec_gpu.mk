# GPU codec throughput (issue 3): from experiments/bench_codec.py's records and the quoted baselines.
FIGURES += out/codec_throughput.png

out/codec_throughput.png: fig_codec_throughput.py ../experiments/results/codec_gpu.jsonl ../experiments/results/codec_gpu_v4.jsonl ../experiments/results/codec_gpu_baselines.jsonl
	$(PYTHON) fig_codec_throughput.py $@ $(filter %.jsonl,$^)

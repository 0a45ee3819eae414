# CPU codec throughput (issue 2): from experiments/bench_codec_cpu.py's records.
FIGURES += out/codec_cpu.png

out/codec_cpu.png: fig_codec_cpu.py ../experiments/results/codec_cpu.jsonl
	$(PYTHON) fig_codec_cpu.py $@ $(filter %.jsonl,$^)

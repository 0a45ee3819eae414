# Scaling projection (issue 7): experiments/project_scaling.py calibrates zipccl.scaling on the
# 2-rank collectives records (re-read whenever one changes) and projects to 64 GPUs; no timing.
FIGURES += out/scaling.png
SCALING_INPUTS := $(sort $(wildcard ../experiments/results/collectives*.jsonl) \
                         $(wildcard ../experiments/results/codec_gpu*.jsonl))

../experiments/results/scaling_projection.jsonl: ../experiments/project_scaling.py ../experiments/records.py \
		../zipccl/scaling.py ../zipccl/costmodel.py $(SCALING_INPUTS)
	$(PYTHON) ../experiments/project_scaling.py --out $@ > /dev/null

out/scaling.png: fig_scaling.py ../experiments/records.py ../experiments/results/scaling_projection.jsonl
	$(PYTHON) fig_scaling.py $@ $(filter %.jsonl,$^)

# feedfast: `make demo` and `make test` each work as the first command on a fresh clone.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
PYTHON ?= python3
# torch with a torchvision that imports beside it, as a user's `pip install torch torchvision` gives (timm and
# torchvision's training references need both). With an NVIDIA driver: the newest CUDA build. Without one, on x86_64:
# torch 2.14.1, a CUDA build that runs on the CPU (5.5 GB; the only CPU build x86_64 machines here hold, torch
# 2.13.0+cpu, has no torchvision on PyPI that imports beside it: "operator torchvision::nms does not exist"); on
# aarch64: torch 2.9.1, a CPU build (0.7 GB). Override with TORCH_SPEC=...; torchvision follows the torch installed.
TORCH_SPEC ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,$(if $(filter aarch64 arm64,$(shell uname -m)),torch==2.9.1,torch==2.14.1))
EXTRAS ?= cuda12,simd,dev,test,plot,compare
# Disk: that set takes 6.8 GB in the venv on x86_64 (torch and its CUDA libraries 6 GB, DALI 1 GB), and pip fails
# half-way with "No space left on device" where less is free. Where the venv's disk has under SMALL_BELOW_GB free
# (and TORCH_SPEC and EXTRAS were not given), the set that fits is installed instead, and said so: torch 2.13.0, the
# CPU build (0.9 GB; these machines hold it on disk), without the extras that need torchvision beside it (compare:
# torchvision; test: timm, Accelerate), whose tests then skip naming the missing package. Only a new venv is sized
# (one already holding torch keeps its set); SMALL=1 forces the small set, SMALL=0 the full one.
SMALL_BELOW_GB ?= 9
FREE_GB := $(shell df -Pk $(dir $(abspath $(VENV))) 2>/dev/null | awk 'NR == 2 {print int($$4 / 1048576)}')
ifeq ($(origin TORCH_SPEC)$(origin EXTRAS),filefile)
SMALL ?= $(shell [ ! -x $(PY) ] && [ -n "$(FREE_GB)" ] && [ "$(FREE_GB)" -lt "$(SMALL_BELOW_GB)" ] && echo 1)
endif
ifeq ($(SMALL),1)
TORCH_SPEC := torch==2.13.0
EXTRAS := cuda12,simd,dev,plot
endif
STAMP  := $(VENV)/.feedfast-installed

.PHONY: setup demo test bench soak gpu-check lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@if [ "$(SMALL)" = 1 ]; then echo "feedfast setup, the small set: torch 2.13.0 (CPU build) and extras $(EXTRAS), \
	without torchvision, timm and Accelerate, whose tests skip ($(FREE_GB) GB free where $(VENV) goes; the full set \
	wants $(SMALL_BELOW_GB) GB, or SMALL=0)"; fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	@# pillow-simd builds from source and links the codecs whose headers it finds: libjpeg and zlib, and libtiff,
	@# OpenJPEG and libwebp, without which valid TIFF (LZMA, old-style JPEG), JPEG 2000 and WebP images that DALI
	@# cannot read either are lost (`feedfast doctor` calls a missing one a problem)
	@if ! printf '#include <jpeglib.h>\n#include <zlib.h>\n#include <tiffio.h>\n#include <webp/decode.h>\n' | \
	    cc -E -x c - >/dev/null 2>&1 || ! ls /usr/include/openjpeg-2.*/openjpeg.h >/dev/null 2>&1; then \
	  echo "installing the libjpeg, zlib, libtiff, OpenJPEG and libwebp headers for pillow-simd"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && \
	  $$SUDO apt-get install -y -q libjpeg-dev zlib1g-dev libtiff-dev libopenjp2-7-dev libwebp-dev; fi
	@# pillow-simd's fast resize paths need AVX2 enabled when it is compiled (its default is SSE4): on a CPU with
	@# AVX2, build it with CC="cc -mavx2" before the extras (which then find it). An installed build is rebuilt
	@# when its module does not record -mavx2 among its compiler flags (`feedfast doctor` says which build is in
	@# use) or when it lacks libtiff, OpenJPEG or libwebp (built before their headers were there)
	@if echo ",$(EXTRAS)," | grep -q ",simd,"; then \
	  CC_SIMD="cc"; grep -qsw avx2 /proc/cpuinfo && CC_SIMD="cc -mavx2"; \
	  if ! $(PY) -c "import sys, PIL.features as f; sys.exit(not all(f.check(c) for c in ('libtiff', 'jpg_2000', 'webp')))" \
	      2>/dev/null || { [ "$$CC_SIMD" != cc ] && \
	      ! grep -qsa -e "-mavx2" $(VENV)/lib/python3*/site-packages/PIL/_imaging.*.so; }; then \
	    echo "building pillow-simd (CC='$$CC_SIMD') with libtiff, OpenJPEG and libwebp"; \
	    CC="$$CC_SIMD" $(PIP) install -q --force-reinstall --no-deps --no-binary pillow-simd --no-cache-dir "pillow-simd>=9.0"; \
	  fi; fi
	@# the extras (DALI, Lightning, Accelerate, timm, matplotlib, torchvision) resolve against the torch build installed
	@# above, never a newer torch from PyPI: torch is pinned to it, and torchvision's own pin on torch picks its match.
	@# matplotlib, torchvision and timm (through torchvision) depend on stock Pillow, which would replace pillow-simd's
	@# PIL: pip resolves the extras (--dry-run --report) and everything it chose but Pillow is installed with --no-deps
	$(PY) -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > $(VENV)/torch-pin.txt
	$(PIP) install -q -c $(VENV)/torch-pin.txt --dry-run --report $(VENV)/extras.json -e ".[$(EXTRAS)]"
	$(PY) -c 'import json, sys; chosen = [p["metadata"] for p in json.load(open(sys.argv[1]))["install"]]; \
	  print(*("%s==%s" % (m["name"], m["version"]) for m in chosen if m["name"].lower() not in ("pillow", "feedfast")), sep="\n")' \
	  $(VENV)/extras.json > $(VENV)/extras.txt
	$(PIP) install -q --no-deps -c $(VENV)/torch-pin.txt -r $(VENV)/extras.txt
	$(PIP) install -q --no-deps -e .
	$(PY) -c "import PIL, nvidia.dali, torch, feedfast; print('feedfast ready: PIL', PIL.__version__, '| DALI', nvidia.dali.__version__, '| torch', torch.__version__)"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/feedfast bench

test: setup
	$(PY) -m pytest -q

# A second environment with torch and stock Pillow (no pillow-simd): the baseline as most users run it.
STOCK := .venv-stock
$(STOCK)/.installed:
	test -x $(STOCK)/bin/python || $(PYTHON) -m venv $(STOCK)
	@# the torch of TORCH_SPEC and torchvision for the recipe row, which pip matches to it (stock Pillow is wanted here)
	$(STOCK)/bin/pip install -q "$(TORCH_SPEC)" torchvision Pillow webdataset braceexpand numpy pyyaml psutil tqdm
	$(STOCK)/bin/pip install -q --no-deps -e .
	touch $@

# SPDL (Meta's thread pipeline, for its row in make bench: spdl_core is pure Python, spdl_io a wheel needing only numpy)
SPDL_SPEC ?= spdl==0.8.0

bench: setup $(STOCK)/.installed
	$(PY) -c "import spdl.io, spdl.pipeline" 2>/dev/null || $(PIP) install -q "$(SPDL_SPEC)"
	$(PY) benchmarks/run.py --out bench-results --stock-python $(STOCK)/bin/python
	@# bookkeeping at ImageNet's shape, a quarter of it (by hand at full size: benchmarks/scale.py; 100M: scale_sim.py)
	$(PY) benchmarks/scale.py --quarter --json bench-results/scale.json
	@# the threaded path's own cost per sample on tiny images, at 1, 2 and 4 threads, the batch plan on and off
	$(PY) benchmarks/hotpath.py --compare --json bench-results/hotpath.json
	@# the same shards local, over a loopback ranged http server and a local S3 (moto): auto's samples/s and first batch
	$(PY) benchmarks/remote.py --json bench-results/remote.json
	@# again with the servers on a core of their own (a real store's CPU is not the loader's): issue 27's target
	$(PY) benchmarks/remote.py --pin --json bench-results/remote-pinned.json

soak: setup
	$(PY) benchmarks/soak.py --epochs 20 --json bench-results/soak.json

lint: setup
	$(VENV)/bin/ruff check feedfast tests
	$(VENV)/bin/mypy feedfast

clean:
	rm -rf $(VENV) build *.egg-info

# The GPU check (benchmarks/gpu_check.py). It needs no venv and no network, so on a GPU machine it runs on that
# machine's own python; WHEELS=DIR installs DALI from a folder of wheels (or NAME.part-* pieces) when it is missing.
# Without CUDA (or with DRY_RUN=1) it is the CPU dry run. Exit 1 when a section errored or the budget ran out.
# It cannot lose the 15-minute GPU lease: sections start within GPU_BUDGET s, the script ends itself at GPU_LIMIT s
# (tracebacks and the JSON written; exit 3), and `timeout` kills it 30 s later should even that not run.
GPU_PY     ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_JSON   ?= bench-results/gpu-check.json
GPU_BUDGET ?= 300
GPU_LIMIT  ?= 360

gpu-check:
	@mkdir -p $(dir $(GPU_JSON))
	timeout -k 5 $$(( $(GPU_LIMIT) + 30 )) $(GPU_PY) benchmarks/gpu_check.py $(if $(WHEELS),--wheels $(WHEELS)) \
	  $(if $(DRY_RUN),--dry-run) --budget $(GPU_BUDGET) --limit $(GPU_LIMIT) --json $(GPU_JSON)

# The pieces for gpu-check on a GPU machine without network (Python 3.12, torch, no DALI, no libjpeg headers). Run
# here, where pip reaches PyPI and a Python 3.12 (python3.12 on PATH or pyenv's; else GPU_BUILD_PY=...) and libjpeg's
# headers are: it installs DALI for CUDA 13 and what it needs (benchmarks/gpucheck_wheels.py PACKAGES) into one site
# folder for Python 3.12, builds feedfast's C extensions beside their libjpeg, packs it all with xz and cuts it into
# GPU_WHEELS/site-py312.tar.xz.part-1-of-N ... part-N-of-N of at most 57,000,000 bytes (it prints them: N = 3 for
# DALI 2.4, about 4 minutes on 2 cores). Copy those N files, nothing else, into one folder on the GPU machine, and run
# there, in this checkout: make gpu-check WHEELS=that-folder
GPU_WHEELS ?= bench-results/gpu-wheels
GPU_BUILD_PY ?=
.PHONY: gpu-wheels
gpu-wheels:
	$(GPU_PY) benchmarks/gpucheck_wheels.py --out $(GPU_WHEELS) $(if $(GPU_BUILD_PY),--build-python $(GPU_BUILD_PY))

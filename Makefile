# Squelch build entry points. `make run` and `make test` are all a new machine needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

SWIFT        ?= swift
CONFIG       ?= debug
BUILD_FLAGS  ?=
DATA_DIR     ?= data
CERTS_DIR    ?= certs
FUZZ_SECONDS ?= 60
FUZZ_DIR     := fuzz
FUZZ_BIN     := $(FUZZ_DIR)/bin
FUZZ_LOGS    := $(FUZZ_DIR)/logs

# Debian packages the build, the tests and the tools need.
# libcurl4 is what FoundationNetworking (URLSession, used by the tests) loads at run time.
DEB_PACKAGES := libopus-dev libasound2-dev libssl-dev pkg-config openssl libsqlite3-dev postgresql alsa-utils libcurl4 tmux espeak-ng sox python3-venv python3-dev build-essential mumble-server nghttp2-client libnghttp2-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help deps build test run bench bench-quick bench-tools certs fuzz fuzz-build clean

help:
	@echo "make run    install what is missing, make dev certificates, start squelchd"
	@echo "make test   install what is missing, build, run every test"
	@echo "make deps | build | bench | certs | fuzz | clean"

# Installs only the packages that are missing, and says which.
deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$missing"; \
	  if [ -n "$(SUDO)" ] && ! command -v sudo >/dev/null; then \
	    echo "deps: not root and sudo is missing; run as root: apt-get install -y$$missing"; exit 1; fi; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
	  echo "deps: all present ($(DEB_PACKAGES))"; \
	fi
	@command -v $(SWIFT) >/dev/null || { echo "deps: swift not found on PATH; install the Swift 6.x toolchain from swift.org"; exit 1; }

# Always build with --build-tests: switching product sets between `swift build` and `swift test`
# recompiles Hummingbird every time (docs/decisions/0044-build-notes.md).
build: deps
	$(SWIFT) build --build-tests -c $(CONFIG) $(BUILD_FLAGS)

# One test at a time (80 s here, against 40 s in parallel). Several tests block a thread of the
# 2-thread cooperative pool on purpose (a restoration delegate waiting on a semaphore, a push delegate
# simulating a cold start, child processes awaited with waitUntilExit); run in parallel, two of them
# at once starved every other test's tasks for seconds, and timing-sensitive tests failed at random.
test: build
	$(SWIFT) test --skip-build --no-parallel -c $(CONFIG) $(BUILD_FLAGS)

certs:
	@./certs/make-dev-certs.sh $(CERTS_DIR)

run: build certs
	$$($(SWIFT) build -c $(CONFIG) --show-bin-path)/squelchd serve --data-dir $(DATA_DIR) \
	  --cert $(CERTS_DIR)/server-chain.pem --key $(CERTS_DIR)/server.key

# The analysis (GCC-PHAT delay, PESQ-WB, STOI) and the report (tables, PNG plots) are Python, in a
# virtual environment of their own under bench/.venv (bench/README.md).
bench-tools: deps
	bench/setup-venv.sh
	@test -f bench/speech.wav || bench/make_speech.sh bench/speech.wav

# The whole suite in release mode, about 15 minutes here: bench/results.json, then docs/benchmarks.md
# and its plots regenerated from it.
bench: deps certs bench-tools
	$(SWIFT) build -c release --product squelch-bench
	$(SWIFT) build -c release --product squelchd
	$$($(SWIFT) build -c release --show-bin-path)/squelch-bench all --results bench/results.json
	bench/.venv/bin/python3 bench/report.py bench/results.json docs/benchmarks.md docs/bench-plots

# A smoke run of every benchmark on the debug build (CI runs it): it must work, its figures mean
# nothing. Results and the report go to a scratch directory.
bench-quick: build certs bench-tools
	@rm -rf .bench-quick && mkdir -p .bench-quick
	$$($(SWIFT) build --show-bin-path)/squelch-bench all --quick --results .bench-quick/results.json
	bench/.venv/bin/python3 bench/report.py .bench-quick/results.json .bench-quick/benchmarks.md .bench-quick/plots

# libFuzzer targets are compiled straight with swiftc from the parser sources they cover, so that a
# fuzz build doesn't rebuild the whole package with sanitizers (see fuzz/README.md). Crashing inputs
# are written to fuzz/logs/; a single input running over 10 s counts as a hang. The Swift runtime's
# backtracer is off while fuzzing: under ASan it reports a bogus overflow in its own crash handler
# instead of the failed precondition, and its helper process can hang after the target exits.
fuzz-build: deps
	@mkdir -p $(FUZZ_BIN)
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name AudioFuzz \
	  $(FUZZ_DIR)/WAVParserFuzz.swift Sources/Audio/WAV.swift Sources/Audio/AudioError.swift \
	  -o $(FUZZ_BIN)/wav-parser
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name WireFrameFuzz \
	  $(FUZZ_DIR)/FrameParserFuzz.swift Sources/Wire/WireBytes.swift Sources/Wire/Frames.swift \
	  -o $(FUZZ_BIN)/frame-parser
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name WirePacketFuzz \
	  $(FUZZ_DIR)/PacketParserFuzz.swift Sources/Wire/WireBytes.swift Sources/Wire/Frames.swift Sources/Wire/PacketHeader.swift \
	  Sources/Wire/MediaEnvelope.swift -o $(FUZZ_BIN)/packet-parser
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name WireHandshakeFuzz \
	  $(FUZZ_DIR)/HandshakeParserFuzz.swift Sources/Wire/WireBytes.swift Sources/Wire/Frames.swift Sources/Wire/HandshakeMessages.swift \
	  -o $(FUZZ_BIN)/handshake-parser
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name EntryTicketFuzz \
	  $(FUZZ_DIR)/EntryTicketFuzz.swift Sources/Wire/EntryTicketContents.swift \
	  -o $(FUZZ_BIN)/entry-ticket
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name ControlMessageFuzz \
	  $(FUZZ_DIR)/ControlMessageFuzz.swift Sources/ChannelProtocol/Messages.swift Sources/ChannelProtocol/MessageCoding.swift Sources/ChannelProtocol/AudioHeader.swift \
	  -o $(FUZZ_BIN)/control-message
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name AudioHeaderFuzz \
	  $(FUZZ_DIR)/AudioHeaderFuzz.swift Sources/ChannelProtocol/AudioHeader.swift \
	  -o $(FUZZ_BIN)/audio-header
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name MediaFrameFuzz \
	  $(FUZZ_DIR)/MediaFrameFuzz.swift Sources/ChannelProtocol/AudioHeader.swift Sources/SFrame/SFrameHeader.swift \
	  Sources/ChannelProtocol/MediaKeyDatagram.swift Sources/ChannelProtocol/Messages.swift Sources/ChannelProtocol/MessageCoding.swift \
	  -o $(FUZZ_BIN)/media-frame
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name APNsRequestFuzz \
	  $(FUZZ_DIR)/APNsRequestFuzz.swift Sources/APNsSimulator/APNsRequestValidation.swift \
	  -o $(FUZZ_BIN)/apns-request
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name JitterBufferFuzz \
	  $(FUZZ_DIR)/JitterBufferFuzz.swift Sources/JitterBuffer/JitterBuffer.swift Sources/JitterBuffer/ReceptionLossMeter.swift Sources/ChannelProtocol/AudioHeader.swift \
	  -o $(FUZZ_BIN)/jitter-buffer
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name PushPayloadFuzz \
	  $(FUZZ_DIR)/PushPayloadFuzz.swift Sources/PTTClient/PushValue.swift \
	  -o $(FUZZ_BIN)/push-payload
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name DevicePushStreamFuzz \
	  $(FUZZ_DIR)/DevicePushStreamFuzz.swift Sources/PushStream/NDJSONLineSplitter.swift Sources/ChannelProtocol/DevicePushProtocol.swift \
	  Sources/PTTClient/PushValue.swift \
	  -o $(FUZZ_BIN)/device-push-stream
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name APNsResponseFuzz \
	  $(FUZZ_DIR)/APNsResponseFuzz.swift Sources/APNs/APNsReason.swift Sources/APNs/DeliveryPolicy.swift Sources/APNs/PushToTalkNotification.swift \
	  Sources/RandomUUID/RandomUUID.swift \
	  -o $(FUZZ_BIN)/apns-response
	$(SWIFT)c -sanitize=fuzzer,address -parse-as-library -g -O -use-ld=lld -module-name HTTP2SessionFuzz -I Sources/CNGHTTP2 \
	  $(FUZZ_DIR)/HTTP2SessionFuzz.swift Sources/HTTP2Session/HTTP2ClientSession.swift Sources/HTTP2Session/HTTP2Shared.swift \
	  -o $(FUZZ_BIN)/h2-session

fuzz: fuzz-build
	@mkdir -p $(FUZZ_LOGS); for t in $(FUZZ_BIN)/*; do \
	  name=$$(basename $$t); mkdir -p $(FUZZ_DIR)/corpus-$$name; \
	  cp -n $(FUZZ_DIR)/seeds/$$name/* $(FUZZ_DIR)/corpus-$$name/ 2>/dev/null || true; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  SWIFT_BACKTRACE=enable=no $$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -artifact_prefix=$(FUZZ_LOGS)/$$name- -print_final_stats=1 $(FUZZ_DIR)/corpus-$$name >$(FUZZ_LOGS)/$$name.log 2>&1 \
	    || { tail -40 $(FUZZ_LOGS)/$$name.log; echo "fuzz: $$name FAILED (log: $(FUZZ_LOGS)/$$name.log)"; exit 1; }; \
	  grep -E "stat::number_of_executed_units|cov:" $(FUZZ_LOGS)/$$name.log | tail -2; \
	done

clean:
	$(SWIFT) package clean
	rm -rf .build-* $(FUZZ_BIN) $(FUZZ_LOGS) $(FUZZ_DIR)/corpus-*

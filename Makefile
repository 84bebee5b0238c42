# OpenCDP — the two commands of README.md, plus helpers for developers.
#   make demo   run the main job (installs missing Debian packages first)
#   make test   build everything and run every test (installs missing packages first)
BUILD      ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS       ?= $(shell nproc)

.PHONY: all deps configure build test demo asan bench package clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCDP_WERROR=ON >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

demo: build
	@bash scripts/demo.sh $(BUILD)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer.
asan:
	@$(MAKE) test BUILD=build-asan BUILD_TYPE=Sanitize

# Debian packages (cmake/packaging.cmake) into $(BUILD)/packages; installed
# under /usr, configuration in /etc.
package: build
	@cd $(BUILD) && cpack -G DEB

bench: build
	@cmake --build $(BUILD) -j $(JOBS) --target benchmarks

clean:
	rm -rf build build-asan

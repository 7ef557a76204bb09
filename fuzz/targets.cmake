# The fuzz targets (fuzz/fuzz_<name>.c) and what each links. Included by
# fuzz/CMakeLists.txt (libFuzzer executables, clang) and tests/CMakeLists.txt
# (replay executables with fuzz/replay_main.c, any compiler, in ctest over
# fuzz/corpus/<name> and fuzz/crashers/<name>).
set(FKVF_FUZZ_TARGETS open decode codec quant append search)
if(FKVF_BUILD_TOOLS)
  # tools/cacheio*.c importers and tools/cli_util.c number parsers
  list(APPEND FKVF_FUZZ_TARGETS safetensors npy npz cli_numbers)
  # tools/llama_state.c and tools/gguf.c (the llama.cpp bridge)
  list(APPEND FKVF_FUZZ_TARGETS llama_state gguf)
endif()

# fkvf_fuzz_link(TARGET NAME): libraries and include paths of target NAME.
function(fkvf_fuzz_link tgt name)
  # internal headers (codec/codec.h, quant/quant.h) are allowed in fuzz targets
  target_link_libraries(${tgt} PRIVATE fkvf_internal)
  target_include_directories(${tgt} PRIVATE ${PROJECT_SOURCE_DIR}/fuzz)
  if(name MATCHES "^(safetensors|npy|npz)$")
    target_link_libraries(${tgt} PRIVATE fkvf_cacheio)
  elseif(name MATCHES "^(llama_state|gguf)$")
    target_link_libraries(${tgt} PRIVATE fkvf_llama)
  elseif(name STREQUAL "codec")
    # the symbol appender is test code (tests/sym_appender.c), not libfkvf
    target_sources(${tgt} PRIVATE ${PROJECT_SOURCE_DIR}/tests/sym_appender.c)
    target_include_directories(${tgt} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  elseif(name STREQUAL "cli_numbers")
    target_sources(${tgt} PRIVATE ${PROJECT_SOURCE_DIR}/tools/cli_util.c
      ${PROJECT_SOURCE_DIR}/tools/cli_llama.c)
    target_link_libraries(${tgt} PRIVATE fkvf_llama fkvf_remote m)
  endif()
endfunction()

# Inputs a target runs on besides fuzz/corpus/<name>: the archive targets
# start from (and replay) the conformance suite too, so their committed
# corpora hold only what adds coverage beyond it (fuzz/README.md).
function(fkvf_fuzz_extra_dirs name out)
  if(name MATCHES "^(open|decode|search)$")
    set(${out} ${PROJECT_SOURCE_DIR}/conformance/files PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# Runs one libFuzzer binary for SECONDS over a fresh copy of its corpus.
#   cmake -DBIN=<fuzzer> -DCORPUS=<checked-in corpus> -DWORK=<scratch folder> -DSECONDS=<n> -P run_fuzzer.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(COPY ${CORPUS}/ DESTINATION ${WORK}/corpus)
execute_process(
  COMMAND ${BIN} -max_total_time=${SECONDS} -timeout=20 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
          -artifact_prefix=${WORK}/artifacts/ ${WORK}/corpus
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BIN} failed (exit ${rc}); the input that failed is in ${WORK}/artifacts/")
endif()

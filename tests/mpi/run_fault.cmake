# Run by ctest (tests/mpi/CMakeLists.txt, headroom_mpi_fault_test): runs an
# mpirun whose job is meant to fail, and passes when it fails the expected way.
#   -DCOMMAND=<mpirun and its arguments, joined by |>
#   -DEXPECT=<regexes joined by |||>: the output matches each; the first one
#            EXPECT_COUNT times (one line per surviving rank), the others at least once
#   -DEXPECT_COUNT=<n> -DWITHIN=<seconds>: mpirun must exit, nonzero, within this time
# A line "headroom-test: killed at <unix microseconds>" in the output (printed
# by a rank just before it SIGKILLs itself) makes it print the time from the
# kill to mpirun's exit.
cmake_minimum_required(VERSION 3.25)
string(REPLACE "|" ";" cmd "${COMMAND}")
string(REPLACE "|||" ";" expect "${EXPECT}")

string(TIMESTAMP t0 "%s%f" UTC)
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT ${WITHIN})
string(TIMESTAMP t1 "%s%f" UTC)
math(EXPR wall_ms "(${t1} - ${t0}) / 1000")

list(JOIN cmd " " shown)
message("--- ${shown} (exit: ${rc}, ${wall_ms} ms) ---\n${out}--- end of output ---")

set(failures "")
if(NOT rc MATCHES "^[0-9]+$")
  string(APPEND failures "\n  mpirun did not exit within ${WITHIN} s (${rc})")
elseif(rc EQUAL 0)
  string(APPEND failures "\n  mpirun exited 0; the job was meant to fail")
endif()
set(first TRUE)
foreach(re IN LISTS expect)
  string(REGEX MATCHALL "${re}" found "${out}")
  list(LENGTH found n)
  if(first)
    if(NOT n EQUAL EXPECT_COUNT)
      string(APPEND failures "\n  expected ${EXPECT_COUNT} line(s) matching '${re}', found ${n}")
    endif()
    set(first FALSE)
  elseif(n EQUAL 0)
    string(APPEND failures "\n  no line matches '${re}'")
  endif()
endforeach()
if(out MATCHES "headroom-test: FAILED")
  string(APPEND failures "\n  a rank reported a failed check (headroom-test: FAILED)")
endif()

if(out MATCHES "headroom-test: killed at ([0-9]+)")
  math(EXPR kill_ms "(${t1} - ${CMAKE_MATCH_1}) / 1000")
  message("kill to mpirun exit: ${kill_ms} ms (job wall time ${wall_ms} ms)")
endif()

if(failures)
  message(FATAL_ERROR "the job did not fail as expected:${failures}")
endif()

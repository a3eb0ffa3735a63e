# Run by ctest as: cmake -DPAGE=<page.md> -DFILE=<source> -P doc_quotes_file.cmake
#
# Passes when PAGE holds FILE in full: a ```cpp block right after the line
# that names FILE ("This is `examples/relu_squared.hpp` in full:") equal to
# the file without its `#pragma once` line. Keeps a page that walks through a
# source file from drifting away from it.
cmake_minimum_required(VERSION 3.25)
foreach(var PAGE FILE NAME)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "doc_quotes_file.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ ${PAGE} page)
file(READ ${FILE} source)
string(REPLACE "#pragma once\n" "" source "${source}")
string(FIND "${page}" "`${NAME}` in full:" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${PAGE} does not say where it quotes ${NAME} (\"`${NAME}` in full:\")")
endif()
string(SUBSTRING "${page}" ${at} -1 rest)
string(FIND "${rest}" "```cpp\n" open)
string(SUBSTRING "${rest}" ${open} -1 rest)
string(LENGTH "```cpp\n" skip)
string(SUBSTRING "${rest}" ${skip} -1 rest)
string(FIND "${rest}" "```\n" close)
string(SUBSTRING "${rest}" 0 ${close} block)
if(NOT block STREQUAL source)
  message(FATAL_ERROR "${PAGE} quotes ${NAME}, but its block differs from the file: copy the file into the page again")
endif()
message(STATUS "${PAGE} quotes ${NAME} as it is")

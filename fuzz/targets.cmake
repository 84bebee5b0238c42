# SPDX-License-Identifier: Apache-2.0
# The libFuzzer targets: <name> is built from fuzz/<name>_fuzz.cc as <name>_fuzz,
# its seed corpus is fuzz/seeds/<name> in the fuzz build, and `make test` runs it
# briefly as the CTest test fuzz.<name> (cmake/fuzz_tests.cmake).
set(CDP_FUZZ_TARGETS protocol nbd_option nbd_request http config segment_log spool spool_meta journal
    control_token mt_tenants key_file x509_identity frame_handshake nbd_server nbd_client)

# SPDX-License-Identifier: Apache-2.0
# Installation and Debian packages (`make package`, packaging/README.md).
#
# Every install rule of the project is here, each in one of four components,
# and each component is one Debian package:
#
#   agent           opencdp-agent            cdp-agent, its unit, /etc/opencdp/agent.conf
#   process_server  opencdp-process-server   cdp-process-server, its unit, its config
#   master_target   opencdp-master-target    cdp-master-target, its unit, its config, mt-tenants
#   tools           opencdp-tools            cdpctl, cdp-loadgen
#
# Each package also brings its man pages (help2man, from --help), copyright and
# changelog under /usr/share/doc/<package>, and the daemons' maintainer
# scripts (packaging/debian/): a system user `opencdp` and /var/lib/opencdp at
# configure; configuration and data kept on remove, removed on purge.
#
# `cmake --install` (any prefix, /usr/local by default) installs the same
# files; the units' ExecStart then names the binaries under that prefix. The
# configuration always goes to /etc/opencdp, where the units look for it, and
# only where no file of that name is there yet (an operator's edits stay).

include(GNUInstallDirs)

set(CDP_DEB_MAINTAINER "OpenCDP maintainers <maintainers@users.noreply.a-seed-2189f243.example>")

# component package section summary description
set(CDP_PACKAGES
  "agent|opencdp-agent|admin|OpenCDP agent: NBD capture tap of protected volumes|Serves each protected volume as an NBD export, captures every write in\norder, keeps a persistent dirty bitmap and resyncs block by block. It\nships to an OpenCDP process server over TLS."
  "process_server|opencdp-process-server|admin|OpenCDP process server: durable spool and WAN shipping|Caches the agents' writes durably, compresses them and ships them to an\nOpenCDP master target across the WAN under a throttle."
  "master_target|opencdp-master-target|admin|OpenCDP master target: replicas, undo journal, recovery points|Applies replicated writes to replicas, keeps the old blocks in an undo\njournal, and offers rollback and point-in-time NBD exports of any\nrecovery point."
  "tools|opencdp-tools|admin|OpenCDP tools: cdpctl and cdp-loadgen|cdpctl operates the OpenCDP daemons (status, tags, exports, rollback,\nverify, tokens, certificates). cdp-loadgen drives change rates and sizes\nWAN links.")

# --- Binaries -----------------------------------------------------------------
install(TARGETS cdp-agent RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT agent)
install(TARGETS cdp-process-server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT process_server)
install(TARGETS cdp-master-target RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT master_target)
install(TARGETS cdpctl cdp-loadgen RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
install(PROGRAMS ${CMAKE_SOURCE_DIR}/loadgen/gentesttree.sh DESTINATION ${CMAKE_INSTALL_DATADIR}/opencdp/loadgen
        COMPONENT tools)

# --- Units, configuration, docs of the daemons ----------------------------------
# daemon component package role config-files (comma-separated) doc
set(CDP_DAEMONS
  "cdp-agent|agent|opencdp-agent|agent|agent.conf|agent.md"
  "cdp-process-server|process_server|opencdp-process-server|process-server|process-server.conf|"
  "cdp-master-target|master_target|opencdp-master-target|master-target|master-target.conf,mt-tenants|recovery.md")
foreach(d IN LISTS CDP_DAEMONS)
  string(REPLACE "|" ";" f "${d}")
  list(GET f 0 daemon)
  list(GET f 1 comp)
  list(GET f 2 pkg)
  list(GET f 4 confs)
  list(GET f 5 docs)
  string(REPLACE "," ";" confs "${confs}")
  # The unit names the binary under the install prefix.
  install(CODE "
    file(READ \"${CMAKE_SOURCE_DIR}/packaging/${daemon}.service\" unit)
    string(REPLACE \"/usr/local/bin/\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/\" unit \"\${unit}\")
    file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\" TYPE FILE
         FILES \"${CMAKE_SOURCE_DIR}/packaging/${daemon}.service\")
    file(WRITE \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/${daemon}.service\" \"\${unit}\")
  " COMPONENT ${comp})
  foreach(c IN LISTS confs)
    # Root-only: systemd hands it to the daemon (LoadCredential).
    install(CODE "
      if(EXISTS \"\$ENV{DESTDIR}/etc/opencdp/${c}\")
        message(STATUS \"Kept: /etc/opencdp/${c}\")
      else()
        file(INSTALL DESTINATION /etc/opencdp TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE
             FILES \"${CMAKE_SOURCE_DIR}/docs/examples/${c}\")
      endif()
    " COMPONENT ${comp})
  endforeach()
  install(FILES ${CMAKE_SOURCE_DIR}/docs/operations.md ${CMAKE_SOURCE_DIR}/docs/architecture.md
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${pkg} COMPONENT ${comp})
  if(docs)
    install(FILES ${CMAKE_SOURCE_DIR}/docs/${docs} DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${pkg}
            COMPONENT ${comp})
  endif()
endforeach()
install(FILES ${CMAKE_SOURCE_DIR}/docs/operations.md ${CMAKE_SOURCE_DIR}/docs/recovery.md
        ${CMAKE_SOURCE_DIR}/docs/loadgen.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/opencdp-tools COMPONENT tools)

# --- Copyright and changelog of every package ----------------------------------
set(CDP_DEB_DIR ${CMAKE_BINARY_DIR}/packaging)
file(MAKE_DIRECTORY ${CDP_DEB_DIR})
string(TIMESTAMP CDP_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
foreach(p IN LISTS CDP_PACKAGES)
  string(REPLACE "|" ";" f "${p}")
  list(GET f 0 comp)
  list(GET f 1 pkg)
  file(WRITE ${CDP_DEB_DIR}/${pkg}.changelog
       "${pkg} (${PROJECT_VERSION}) unstable; urgency=medium\n\n"
       "  * Built from the OpenCDP source tree (git log has the history).\n\n"
       " -- ${CDP_DEB_MAINTAINER}  ${CDP_DATE}\n")
  add_custom_command(OUTPUT ${CDP_DEB_DIR}/${pkg}/changelog.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CDP_DEB_DIR}/${pkg}
    COMMAND gzip -9n -c ${CDP_DEB_DIR}/${pkg}.changelog > ${CDP_DEB_DIR}/${pkg}/changelog.gz
    DEPENDS ${CDP_DEB_DIR}/${pkg}.changelog VERBATIM)
  list(APPEND CDP_PACKAGE_FILES ${CDP_DEB_DIR}/${pkg}/changelog.gz)
  install(FILES ${CDP_DEB_DIR}/${pkg}/changelog.gz ${CMAKE_SOURCE_DIR}/packaging/debian/copyright
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${pkg} COMPONENT ${comp})
endforeach()

# --- Man pages, from --help -----------------------------------------------------
find_program(HELP2MAN help2man)
# binary component section description
set(CDP_MANPAGES
  "cdp-agent|agent|8|NBD capture tap of protected volumes"
  "cdp-process-server|process_server|8|durable spool and WAN shipping of replicated writes"
  "cdp-master-target|master_target|8|replicas, undo journal and recovery points"
  "cdpctl|tools|1|operate the OpenCDP daemons"
  "cdp-loadgen|tools|1|change-rate generator and WAN sizing for OpenCDP")
if(HELP2MAN)
  foreach(m IN LISTS CDP_MANPAGES)
    string(REPLACE "|" ";" f "${m}")
    list(GET f 0 bin)
    list(GET f 1 comp)
    list(GET f 2 sect)
    list(GET f 3 desc)
    set(page ${CDP_DEB_DIR}/man/${bin}.${sect}.gz)
    add_custom_command(OUTPUT ${page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CDP_DEB_DIR}/man
      COMMAND ${HELP2MAN} --no-info --section=${sect} --name=${desc} --output=${CDP_DEB_DIR}/man/${bin}.${sect}
              $<TARGET_FILE:${bin}>
      COMMAND gzip -9n -f ${CDP_DEB_DIR}/man/${bin}.${sect}
      DEPENDS ${bin} VERBATIM)
    list(APPEND CDP_PACKAGE_FILES ${page})
    install(FILES ${page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${sect} COMPONENT ${comp})
  endforeach()
else()
  message(WARNING "help2man not found (scripts/install-deps.sh installs it): no man pages, no packages")
endif()
add_custom_target(package-files ALL DEPENDS ${CDP_PACKAGE_FILES})

# --- CPack: one .deb per component ----------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME opencdp)
set(CPACK_PACKAGE_VENDOR "OpenCDP")
set(CPACK_PACKAGE_CONTACT "${CDP_DEB_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Packages install under /usr whatever the build's CMAKE_INSTALL_PREFIX, the
# configuration in /etc; CPack installs with DESTDIR so that the units'
# ExecStart is written with the real prefix.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL agent process_server master_target tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/opencdp/opencdp")
set(CMAKE_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
    OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
foreach(p IN LISTS CDP_PACKAGES)
  string(REPLACE "|" ";" f "${p}")
  list(GET f 0 comp)
  list(GET f 1 pkg)
  list(GET f 2 section)
  list(GET f 3 summary)
  list(GET f 4 desc)
  string(TOUPPER ${comp} C)
  set(CPACK_DEBIAN_${C}_PACKAGE_NAME ${pkg})
  set(CPACK_DEBIAN_${C}_PACKAGE_SECTION ${section})
  set(CPACK_DEBIAN_${C}_DESCRIPTION "${summary}\n${desc}")
endforeach()
# The daemons: maintainer scripts made from packaging/debian/*.in, and adduser.
foreach(d IN LISTS CDP_DAEMONS)
  string(REPLACE "|" ";" f "${d}")
  list(GET f 0 daemon)
  list(GET f 1 comp)
  list(GET f 3 role)
  list(GET f 4 confs)
  string(REPLACE "," ";" confs "${confs}")
  string(TOUPPER ${comp} C)
  set(CDP_ROLE ${role})
  set(CDP_UNIT ${daemon}.service)
  set(CDP_CONFFILES "")
  foreach(c IN LISTS confs)
    string(APPEND CDP_CONFFILES "/etc/opencdp/${c}\n")
  endforeach()
  set(extra)
  foreach(s postinst prerm postrm)
    configure_file(${CMAKE_SOURCE_DIR}/packaging/debian/${s}.in ${CDP_DEB_DIR}/${comp}/${s} @ONLY
                   FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ
                   WORLD_EXECUTE)
    list(APPEND extra ${CDP_DEB_DIR}/${comp}/${s})
  endforeach()
  file(WRITE ${CDP_DEB_DIR}/${comp}/conffiles "${CDP_CONFFILES}")
  list(APPEND extra ${CDP_DEB_DIR}/${comp}/conffiles)
  set(CPACK_DEBIAN_${C}_PACKAGE_CONTROL_EXTRA "${extra}")
  set(CPACK_DEBIAN_${C}_PACKAGE_DEPENDS "adduser")
endforeach()
include(CPack)

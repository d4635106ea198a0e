#!/usr/bin/env bash
# Headless Chromium and its driver from Debian, for tests/ui/test_browser.py (which skips without them).
# A machine without apt-get, or without the rights to use it, is left as it is: this script never fails.
set -u
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    echo "install_browser: $(chromium --version) and $(chromedriver --version | cut -d' ' -f1-2) present"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install_browser: no apt-get here: the browser test will be skipped"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
        echo "install_browser: not root and no sudo: the browser test will be skipped"
        exit 0
    fi
fi
if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; then
    echo "install_browser: installed $(chromium --version)"
else
    echo "install_browser: apt-get could not install chromium: the browser test will be skipped"
fi
exit 0

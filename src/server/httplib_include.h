#pragma once
// Debian's libcpp-httplib.so is built with OpenSSL, zlib and Brotli support, and those
// switches change class layouts (Request gains an SSL pointer): declarations must be seen
// with the same switches the library was compiled with, or the two disagree at run time.
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>

// libnghttp2 from Debian's libnghttp2-dev: the HTTP/2 engine of the APNs client (docs/architecture.md).
#include <nghttp2/nghttp2.h>

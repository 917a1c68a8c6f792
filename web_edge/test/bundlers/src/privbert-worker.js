// the page's privatizing Worker: the library's worker side, nothing else
import "@privbert/edge/worker";

// The `ws` package is loaded dynamically and used through the minimal interface in
// transport.ts, so neither this package nor its users need @types/ws.
declare module "ws";

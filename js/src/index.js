// ckfrelay router client for JavaScript: the consumer WebAssembly module's
// host, a relay stream follower, catalog bootstrap and wire v1 frame decoding.
export { Router, SessionError } from "./router.js";
export { Consumer, AbiError, compileModule, Outcome, FaultNames, Code, QueryKind, BASE_SALT, MAX_INPUT_BYTES, encodeTokenQuery } from "./module.js";
export { decodeFrame, readFrames, FrameError, Kind, DEFAULT_MAX_FRAME_BYTES } from "./frame.js";
export { fetchCatalog, manifestFromCatalog, encodeManifest, encodeAssignment } from "./catalog.js";
export { decode as decodeMsgpack, MsgpackError } from "./msgpack.js";

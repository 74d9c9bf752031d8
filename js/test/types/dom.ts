// Type-checked under tsconfig.dom.json only: with the DOM lib the module
// type is exactly WebAssembly.Module, not a looser stand-in.
import { compileModule, Consumer } from "@ckfrelay/router";
import type { WasmModule } from "@ckfrelay/router";

type Equals<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true : false;
export const exact: Equals<WasmModule, WebAssembly.Module> = true;

export async function dom(): Promise<void> {
  const m: WebAssembly.Module = await compileModule();
  await Consumer.instantiate(m);
  await Consumer.instantiate(await WebAssembly.compile(new Uint8Array(0)));
}

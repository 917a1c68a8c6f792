#!/usr/bin/env node
// privbert-edge: the web edge's command line (built by `npm ci`, which runs the package's
// prepare script: tsc into dist/).
import { main } from "../dist/node/cli.js";

process.exitCode = await main(process.argv.slice(2));

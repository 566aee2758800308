#!/usr/bin/env node
// The installed command. All logic lives in dist/ (compiled from ts/).
import { run } from '../dist/cli/main.js';

await run();

// `node --import <this file>`: registers ./hooks.mts (what the process loads, into ZTN_MODULE_LOG).
import { register } from 'node:module';

register(new URL('./hooks.mjs', import.meta.url));

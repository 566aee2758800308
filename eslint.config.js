// Lint for the TypeScript layer, the TypeScript tests, and the JavaScript scripts and benchmarks.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'dist-test/', 'target/', 'node_modules/', 'ts/native/binding.cjs', 'ts/native/binding.d.cts', 'ts/gen/', 'npm/', 'bench/results/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['**/*.{js,mjs,cjs}'],
    languageOptions: { globals: globals.node },
  },
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  // Type-aware rules for the TypeScript layer: a promise nobody awaits or handles is a rejection nobody sees (the
  // daemon's lifecycle is promise chains), and a promise where a callback's result is ignored is one too.
  {
    files: ['ts/**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': ['error', { ignoreVoid: false }],
      '@typescript-eslint/no-misused-promises': 'error',
    },
  },
);

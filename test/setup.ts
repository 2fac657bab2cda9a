import 'reflect-metadata';
import { Container } from 'typedi';
import { beforeEach } from 'vitest';

// Every test starts with an empty command registry.
beforeEach(() => {
  Container.reset();
});

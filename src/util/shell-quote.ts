export { execLine, shellQuote } from '../../runtime/protocol/shell-words.js';
